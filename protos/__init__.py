"""Protocol buffer definitions of the serving API (see the serving issue)."""
