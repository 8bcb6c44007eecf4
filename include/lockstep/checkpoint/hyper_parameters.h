#pragma once
/// A module's hparams() in a checkpoint: the JSON object as the `hyper_parameters` dict of IValues
/// that torch.load reads typed (Lightning's key), and back.

#include <nlohmann/json.hpp>

#include <lockstep/checkpoint/checkpoint_io.h>

namespace lockstep {
namespace checkpoint {

/// `hparams` as a checkpoint value, types kept: null -> None, bool, integer -> int, number ->
/// float, string, array -> list, object -> dict (string keys). Throws UsageError for JSON's
/// binary values, which neither YAML nor torch.load would read back.
///   ckpt.insert("hyper_parameters", hyper_parameters_value(module.hparams()));
c10::IValue hyper_parameters_value(const nlohmann::json& hparams);

/// The checkpoint value `value` as JSON, types kept (the inverse of hyper_parameters_value; a
/// tuple becomes a list). A one-element tensor becomes its number; anything else JSON cannot hold
/// (a larger tensor, an object) becomes a string describing it, so that reading never fails.
nlohmann::json hyper_parameters_json(const c10::IValue& value);

/// The `hyper_parameters` of `checkpoint` as a JSON object: empty when it has none. A module
/// built from a checkpoint (Lightning's load_from_checkpoint) reads its settings from here.
///   auto hp = hparams_of(CheckpointIO().load("last.ckpt"));
///   double lr = hp.value("lr", 1e-3);
nlohmann::json hparams_of(const Checkpoint& checkpoint);

}  // namespace checkpoint
}  // namespace lockstep
