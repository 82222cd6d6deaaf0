"""Results and stores out to other tools' formats (the export commands' back ends): clip_benchmark.py
(CLIP_benchmark's result JSON), store_ids.py (a store's embeddings under human ids, and the stores' listing)."""
