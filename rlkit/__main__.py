from rlkit.cli import main

main()
