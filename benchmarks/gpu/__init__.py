"""Several GPUs and the GPU estimate: data parallel, tensor parallel, estimate against a GPU run."""
