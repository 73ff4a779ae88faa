"""The demo's training loop (DDP + a 2x2 mesh) as a test job; arguments as dashboard.demo_train."""

from dashboard.demo_train import main

main()
