"""TensorRTPartitioner: claims MoE regions and the supported ops around them."""
