"""Workers that leave a running job without stopping the others (`faults.on_loss: continue`):
the membership agreed through the job's store and its process groups (`world`), the training
loop's regroup in place (`loop`) and the launcher that lets a worker end without ending the
job (`launch`)."""
