"""What runs on a GPU machine only: the plans of a lent machine's calls
(gpu_run.sh, gpu_short.sh) and the profilers they call."""
