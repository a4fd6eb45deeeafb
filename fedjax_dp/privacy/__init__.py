"""The privacy layer: typed inputs (:mod:`.inputs`), the plan (:mod:`.plan`), clipping in
any Lp norm, noise mechanisms, accountants, the papers' formulas, and the registries of
clip modes, selection rules, schedules and correlated noise. It reads no run config
(docs/architecture.md, "The privacy layer and its typed inputs")."""
