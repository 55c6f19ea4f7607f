"""Predefined LLM recipes on the console's clusters: runs/ (launch, follow, pages, API), registry/
(MLflow), serving/ (endpoints, reconcile, the router), catalog/ (the recipes as data) and node/ (what
runs ON the nodes, free of Django). docs/layout.md draws the path each request takes."""
