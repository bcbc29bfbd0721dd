from ctrls.cli import main

main()
