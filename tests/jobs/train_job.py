"""The demo's training loop (DDP + a 2x2 mesh) as a test job; arguments as dashboard.demo.train."""

from dashboard.demo.train import main

main()
