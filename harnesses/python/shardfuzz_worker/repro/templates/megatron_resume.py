# -------------------------------------------------------------- the layout the run resumes into


def resumed_layout():
    """Where the case resumes into another layout (RESUMED_DDP_SETTINGS): (relayout(), which rebuilds megatron's
    parallel state for its tensor- and pipeline-parallel degrees (RESUMED_TP, RESUMED_PP, RESUMED_VS virtual stages)
    and distributed-optimizer instances, its DDP settings, its optimizer settings); else None."""
    if RESUMED_DDP_SETTINGS is None:
        return None

    def relayout():
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=RESUMED_TP, pipeline_model_parallel_size=RESUMED_PP,
            virtual_pipeline_model_parallel_size=RESUMED_VS if RESUMED_VS > 1 else None,
            num_distributed_optimizer_instances=RESUMED_DDP_SETTINGS["num_distributed_optimizer_instances"])

    return relayout, RESUMED_DDP_SETTINGS, RESUMED_OPTIMIZER_SETTINGS
