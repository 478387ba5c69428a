"""Search-agent environment pieces: corpora, retrievers, QA datasets, the synthetic world."""
