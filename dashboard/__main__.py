from dashboard.cli import main

main()
