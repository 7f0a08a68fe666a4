"""MoE Chat: chat with large Mixture-of-Experts models on one machine."""
