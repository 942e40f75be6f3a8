"""The training step's pieces, shared by every algorithm: the run context (``context``), rollouts and their scoring
(``rollouts``), multi-turn episodes (``episodes``), the asynchronous rollout producer (``producer``), the step loop
(``loops``), the on-policy step of REINFORCE and distillation (``onpolicy``), supervised batches (``supervised``), losses (``losses``), advantage estimators (``advantages``),
optimizers and schedules (``optim``) and the health checks between trainer and engine (``health``)."""
