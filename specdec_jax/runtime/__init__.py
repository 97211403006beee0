"""Process runtime shared by I/O, training and jobs: progress bars, resumable
logs, many-process runs on JAX's runtime, and in-loop step timing."""
