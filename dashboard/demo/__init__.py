"""``pgdash demo``: a server and a real CPU (gloo) training job with a fault to inject."""
