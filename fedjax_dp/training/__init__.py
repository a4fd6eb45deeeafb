"""The compiled round and what runs inside it: one client's local training
(:mod:`.client`, :mod:`.one_step`), the round over a cohort (:mod:`.rounds`), the
sweep program over lanes of runs (:mod:`.program`), evaluation (:mod:`.evaluation`),
the chunk sizing from free memory (:mod:`.memory`), the key derivations
(:mod:`.keys`), and the facade that re-exports them (:mod:`.engine`)."""
