"""What a run writes: ownership of output folders, atomic writes and the manifest
that lets the project remove only its own files (:mod:`.outputs`), and run
directories, metrics and summaries (:mod:`.results`)."""
