"""python -m serving.http_front: one HTTP front worker; serving/http_front/proxy.py says what it does."""

from serving.http_front.proxy import main

main()
