"""The embed job's stages, below every executor: decode.py (Pillow), dali.py (DALI), decoders.py (by name),
encode.py (image and text towers in batches), job.py (the job as data, and the stages every executor runs).
Which executor runs them: hardrank.executors; the pipeline that fills the stores: hardrank.embed."""
