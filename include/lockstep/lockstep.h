#pragma once
/// Lockstep: distributed training for LibTorch. This header includes every public interface.

#include <torch/torch.h>

#include <lockstep/accelerators/device_parser.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/blas.h>
#include <lockstep/core/usage_error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/process_group.h>
#include <lockstep/distributed/rank_zero.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/environments/kubeflow_environment.h>
#include <lockstep/environments/local_environment.h>
#include <lockstep/environments/lsf_environment.h>
#include <lockstep/environments/mpi_environment.h>
#include <lockstep/environments/slurm_environment.h>
#include <lockstep/environments/torchelastic_environment.h>
#include <lockstep/launchers/fork_launcher.h>
#include <lockstep/launchers/launch.h>
#include <lockstep/launchers/launcher.h>
#include <lockstep/launchers/subprocess_launcher.h>
