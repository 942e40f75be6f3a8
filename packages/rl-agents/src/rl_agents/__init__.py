"""rl-core agents: any OpenAI-client program as an environment, through an endpoint the run serves."""
