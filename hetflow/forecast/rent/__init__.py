"""Which machines to rent (pure, no I/O): the rental market's candidates with their step-time
curves, the mixes searched and priced with the simulator's step (`forecast.simulate.step`), on
demand or on spot, and what a recommendation shows.

Modules: `rental` (the candidates of the market), `measured` (curves from the profile
history), `mix` (a candidate, a mix as predicted), `search` (the mixes priced, the choice),
`objective` (what 'best' means), `spot` and `spot_table` (interruptions and their cost),
`table` (what a choice shows), `recommend` (the one pipeline of `hetflow recommend` and the
flow).
"""
