from serving.api.app import main

main()
