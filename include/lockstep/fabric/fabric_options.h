#pragma once
/// FabricOptions: what a Fabric is configured by: the PlanOptions it shares with the Trainer
/// (accelerator, devices, strategy, num_nodes, precision, ...; plan/plan_options.h), with the same
/// names, defaults and checks; as flags, cli::add_fabric_flags adds them. Built in code, the
/// fields still at their defaults take their LOCKSTEP_TRAINER_* variables when the Fabric is made
/// (plan/trainer_variables.h).

#include <lockstep/plan/plan_options.h>

namespace lockstep {

///   Fabric fabric(FabricOptions().devices("2").strategy("ddp"));
struct FabricOptions : PlanOptionsOf<FabricOptions> {};

}  // namespace lockstep
