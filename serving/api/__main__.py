"""python -m serving.api: the API front; serving/api/app.py has its routes and options."""

from serving.api.app import main

main()
