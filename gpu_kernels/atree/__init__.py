"""A-Tree (Ji and Jacobsen, SIGMOD 2021): ``dag`` (the host DAG of unique
nodes, §4), ``layout`` (its level-ordered flat arrays) and ``cpu`` (event
matching, §5).  No CUDA twin yet."""
