"""The command line and the jobs behind it (installed as hardrank.jobs); the only package importing Ray."""
