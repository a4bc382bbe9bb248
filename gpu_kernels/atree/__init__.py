"""A-Tree (Ji and Jacobsen, SIGMOD 2021): ``dag`` (the host DAG of unique
nodes, §4), ``layout`` (its level-ordered flat arrays), ``cpu`` (event
matching, §5) and ``cuda`` (its device twin: level-wise propagation)."""
