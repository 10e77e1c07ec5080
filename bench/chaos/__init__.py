"""The mirror against an adversary: a generator drives load (`load`), a nemesis injects random faults and undoes
them (`nemesis`), and a checker reads both clusters at the end (`check`); `run` puts them together, and
`python -m bench.chaos` runs it for as long as asked and writes the result to bench/results/."""
