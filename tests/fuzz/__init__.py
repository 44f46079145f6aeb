"""A mutation fuzzer for every snapops format and CLI entry point: seeds built by code
(:mod:`.seeds`), mutations (:mod:`.mutate`), targets (:mod:`.targets`), cases run in a
memory- and time-limited worker process (:mod:`.engine`); ``python -m tests.fuzz`` for long
runs, ``tests/fuzz/test_fuzz.py`` for the suite's short derandomized run."""
