"""bench/scale: the data jobs on one process and on Dask as the rows grow (``__main__``), the
interaction screen on a cluster (``screen``) and the cost model of a billion rows a day
(``model``)."""
