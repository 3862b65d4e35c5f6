from fedlit.cli import main

main()
