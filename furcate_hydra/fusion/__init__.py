"""Fused trials: the members of a group (same architecture, same data, different
hyperparameters) trained as one vmapped model in one process, each still its own trial.

Runs in the job's process, beside the app's Lightning: torch is imported here.

    stack.py        the members' parameters and buffers stacked along a leading member axis
    step_logs.py    what ``self.log`` records inside a vmapped step, per member
    optimizer.py    one optimizer step over the stacked parameters, each member's own
                    hyperparameters read from its own torch optimizer (its scheduler moves them)
    settings.py     the Trainer settings that shape training, read from a Trainer
    refusals.py     why a module cannot be fused: one line per reason
    fused_fit.py    the training loop Lightning's fit runs, for all members at once
"""
