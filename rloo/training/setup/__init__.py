"""What a run is built from: the policy and reference models, vision-language policies, the
optimizer and the LR schedule."""
