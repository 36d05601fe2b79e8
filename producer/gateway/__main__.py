from producer.gateway.cli import main

main()
