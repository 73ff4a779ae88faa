"""What tests (and bench/) share: real processes, real PostgreSQL/Redis, a TCP balancer, a
stand-in NVML, and the event builders of the pure tests. No test file imports another."""
