"""The launcher's side of a sweep: its options, the jobs' configs composed, the launch session
over the scheduler and an executor, the backend chosen, what the session shows, and the
streaming contract furcate's sweepers drive it by."""
