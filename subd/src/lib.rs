//! subd: the agent on every provisioned machine.
