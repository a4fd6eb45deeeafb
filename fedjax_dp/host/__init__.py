"""The host side of a run: building it from a config (:mod:`.building`: config ->
Setup), its per-round loop (:mod:`.run_loop`: schedule, sampler, accountant),
batched running of several runs as lanes of one program (:mod:`.groups`), and
checkpoints with resume (:mod:`.checkpoint`)."""
