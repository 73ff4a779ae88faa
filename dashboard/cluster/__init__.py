"""Several server processes on one PostgreSQL and one Redis: leases say which process owns
(folds and judges) each job, and a dead owner's jobs are adopted by another."""
