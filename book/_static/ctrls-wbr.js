/* CTRLS companion: long code names (the method page's index, file names in prose: ctrls/spectral.py::spectral_embedding,
   tests/test_spectral.py::test_equals_top_k_of_the_gram_eigendecomposition) may break after '/', '::',
   '.' and '_', never inside a word: a <wbr> after each, and ctrls.css keeps the browser from breaking
   anywhere else. */
(() => {
  const BREAK_AFTER = /(::(?=\w)|[/_](?=\w)|\.(?=[A-Za-z]))/g;  // not inside a number: Sec. 5.2
  const run = () => {
    for (const code of document.querySelectorAll('article code.literal')) {
      if (code.dataset.ctrlsWbr) continue;
      code.dataset.ctrlsWbr = '1';
      const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
      const texts = [];
      while (walker.nextNode()) texts.push(walker.currentNode);
      for (const t of texts) {
        const parts = t.nodeValue.split(BREAK_AFTER);
        if (parts.length < 2) continue;
        const frag = document.createDocumentFragment();
        // split() with a capture group: [text, sep, text, sep, ..., text]
        for (let i = 0; i < parts.length; i++) {
          frag.appendChild(document.createTextNode(parts[i]));
          if (i % 2 === 1) frag.appendChild(document.createElement('wbr'));
        }
        t.parentNode.replaceChild(frag, t);
      }
    }
  };
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', run); else run();
})();
