from detaudit.cli.commands import main

main()
