"""Fused trials: the members of a group (same architecture, same data, different
hyperparameters) trained as one vmapped model in one process, each still its own trial.

Runs in the job's process, beside the app's Lightning: torch is imported here.

    stack.py           the members' parameters and buffers along a leading member axis
    member_scalars.py  plain numbers that differ per member (a loss weight), per member
    vmapped_step.py    a module's hook run for every member at once
    step_logs.py       what ``self.log`` records inside a vmapped step, per member
    epoch_means.py     a logged name's epoch value, reduced as Lightning reduces it
    optimizer.py       one optimizer step over the stacked parameters, each member's own
                       hyperparameters read from its own torch optimizer (its scheduler
                       moves them), its state in torch's own form in and out
    settings.py        the Trainer settings that shape training, read from a Trainer
    fit_call.py        an app's ``trainer.fit(...)`` read as a member: its data, optimizer
                       and schedulers, or why it runs alone
    fused_fit.py       the training loop Lightning's fit runs, for all members at once
    member_progress.py how far a member trained, counted as Lightning's fit loop counts
    member_checkpoint.py  a member's own Lightning checkpoint, as its own run would save it
    final_metrics.py   a member's callback_metrics at the end, named as Lightning names them
    member_stopping.py each member's own EarlyStopping and Optuna pruning, on its own values
    member_records.py  what each member's loggers and history get, at Lightning's steps
    signature.py       what the members of a group share
    module_values.py   every value a member's module holds besides its tensors, by path
    step_reads.py      what a module's steps read of it, recorded while a probe step runs
    trainer_view.py    what a fused step may read of its Trainer: the epoch, the steps taken
    random_states.py   the random states a fit draws from, saved and put back
    member_streams.py  each member's own random states through its group's training
    refusals.py        why a module cannot be fused, read from it: one line per reason
    probe.py           why it cannot, shown by running one step
    lineage.py         whose a class is (Lightning's, torchmetrics'), which hooks it defines
    sample_batch.py    a batch for a probe or a timing, drawn from no random stream
    grouping.py        which members train together, and each one left alone's reason
    group_width.py     how many of a group train at once when fuse_max is unset: measured
    rendezvous.py      the members' processes find each other: one leads, the others follow
    coordinator.py     the leader: groups formed, each trained as one, each member its end
"""
