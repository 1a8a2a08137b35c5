"""The forecast layer (pure: no infra, no torch): what a job takes on which machines, in two
rooms. `simulate`: the scale simulator, one step predicted from the workers, the model and the
network (`hetflow simulate`). `rent`: which machines to rent, on demand or spot, priced with
the simulator's step (`hetflow recommend`). What reads infra (the catalog, prices, the spot
table, the profile history) is read by the caller, in `hetflow.tasks` or `hetflow.cli`, and
passed in.
"""
