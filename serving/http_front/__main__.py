from serving.http_front.proxy import main

main()
