from producer.dashboard.cli import main

main()
