"""Load against a deployment: Locust users and the acceptance bar (python -m loadtest), and faults under load
with every request counted (python -m loadtest.reliability)."""
