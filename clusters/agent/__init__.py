"""The cluster agent: a small authenticated HTTP service on the cluster's controller that does the few
things slurmrestd cannot, on an allow-list (server.py, standard library only, so a VM runs it as
is), and the console's client for it (client.py). docs/backends.md, "The cluster agent"."""
