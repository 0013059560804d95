"""bench/compare.py's parts: results in, verdicts, tables and charts out.

names      the benchmark naming scheme (group, series, bytes)
results    Google Benchmark JSON read into Stats; runs merged
targets    the in-run targets' JSON: merged over runs, printed, summarised
rule       the comparison rule: a Row and its verdict per benchmark
tables     the text table of rows
charts     PNG charts (matplotlib, when it can be imported)
baselines  stored baselines: machine slugs, where they live, recording
bazel      the Bazel commands (build, query, bazel-bin) and the shell's PATH
runs       running a benchmark binary, one repetition per process
judge      one binary's results judged, printed and written as a verdict
ab         the A/B run against a git commit
options    what a command line asks for
cli        the command line (argparse) and main()
"""
