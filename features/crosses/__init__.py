"""Cross-feature learning on top of the data layer (``features``): which field crosses matter.

* ``artifact``: the cross artifact (ranked crosses as JSON) and ``add_crosses``, which turns its
  top crosses into schema fields of kind ``cross`` for training.
* FIVES, the edge search (Xie et al., KDD'21): ``fives_config`` (settings), ``fives_encoding``
  (fields -> ids), ``fives_graph`` (adjacency and propagation math), ``fives_network`` (the
  Keras layer), ``fives_readout`` (crosses read off a trained network), ``fives_screen`` (the
  interaction screen merged into the ranking) and ``fives_search`` (the search itself).
* ``interaction_screen``: an exhaustive weighted-ANOVA test of every field pair or triple.
* ``cross_columns``: cross columns of a table as integer ids and one-hot matrices, and pairwise
  mutual information (the baselines that searched crosses are compared against).
* PCF-GNN pre-training (SIGIR'21): ``pcf_config`` (settings), ``pcf_graph`` (the pair graph),
  ``pcf_build`` (building it from record batches), ``pcf_gnn`` (the GNN and its training) and
  ``pcf_artifact`` (the serving artifact).

The data layer never imports this subpackage; import the modules themselves (this file loads
nothing).
"""
