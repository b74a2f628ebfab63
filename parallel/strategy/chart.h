#pragma once
// The search as one picture: every layout's predicted step time against its memory per rank, the
// device's memory as a line, the layouts that fit drawn solid and the others hollow, and the
// frontier (the fitting layouts no other beats in both time and memory) joined and labelled.
#include <string>
#include <vector>

#include "parallel/strategy/predict.h"

namespace zero::strategy {

// The layouts on the frontier, by memory: fitting, and no fitting layout both faster and smaller.
std::vector<const Prediction*> frontier(const std::vector<Prediction>& predictions);

// An SVG of `predictions` (supported ones) against `device_memory`, what a layout may use per device
// (Cluster::usable_memory).
std::string frontier_svg(const std::vector<Prediction>& predictions, double device_memory, const std::string& title);

}  // namespace zero::strategy
