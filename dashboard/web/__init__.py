"""The server's edge towards people and their tools: the Flask app (pages and the HTTP API),
the browsers' live feed, display states of ranks and groups (views, live sections), access
control, Prometheus metrics and webhook notifications. Nothing below imports it."""
