"""What runs ON a cluster's nodes: the training entry point (train.py) with its layouts (distributed.py)
and shipped data, and the CPU replica server (serve.py). Copied into each cluster's shared home
(clusters.services.runtime); it imports no Django and nothing of the console but clusters.rendezvous,
which the runtime ships beside it (.importlinter says so)."""
