// CartPole: the classic cart-pole balancing task with the physics of Gym's CartPole-v1
// (Barto, Sutton & Anderson 1983; Euler integration), plus a lockstep vector of environments.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

namespace cartpole {

// One cart-pole. Observation: cart position, cart velocity, pole angle, pole angular velocity.
// Actions: 0 pushes the cart left, 1 pushes it right. Reward 1 per step (including the last);
// an episode terminates when the cart leaves [-2.4, 2.4] or the pole tilts past 12 degrees,
// and is truncated after 500 steps.
class CartPole {
 public:
  static constexpr int kObsDim = 4;
  static constexpr int kNumActions = 2;
  using Obs = std::array<float, kObsDim>;

  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassPole + kMassCart;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;  // seconds between state updates
  static constexpr double kThetaThreshold = 12 * 2 * std::numbers::pi / 360;
  static constexpr double kXThreshold = 2.4;
  static constexpr int kMaxSteps = 500;

  struct StepResult {
    Obs obs;  // observation after the step
    float reward;  // always 1
    bool terminated;  // the pole fell or the cart left the track
    bool truncated;  // the time limit was reached (and the episode did not terminate)
  };

  // Starts a new episode: every state variable uniform in [-0.05, 0.05].
  Obs reset(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (double& s : state_) s = u(rng);
    steps_ = 0;
    return obs();
  }

  StepResult step(int action) {
    auto& [x, x_dot, theta, theta_dot] = state_;
    const double force = action == 1 ? kForceMag : -kForceMag;
    const double costheta = std::cos(theta), sintheta = std::sin(theta);
    const double temp = (force + kPoleMassLength * theta_dot * theta_dot * sintheta) / kTotalMass;
    const double thetaacc = (kGravity * sintheta - costheta * temp) /
                            (kLength * (4.0 / 3.0 - kMassPole * costheta * costheta / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
    // Euler: positions advance with the old velocities.
    x += kTau * x_dot;
    x_dot += kTau * xacc;
    theta += kTau * theta_dot;
    theta_dot += kTau * thetaacc;
    ++steps_;
    const bool terminated = x < -kXThreshold || x > kXThreshold || theta < -kThetaThreshold || theta > kThetaThreshold;
    const bool truncated = !terminated && steps_ >= kMaxSteps;
    return {obs(), 1.0f, terminated, truncated};
  }

  Obs obs() const {
    return {static_cast<float>(state_[0]), static_cast<float>(state_[1]), static_cast<float>(state_[2]),
            static_cast<float>(state_[3])};
  }

 private:
  std::array<double, kObsDim> state_{};
  int steps_ = 0;
};

// n cart-poles stepped in lockstep, resetting automatically when an episode ends. Each keeps
// its own RNG stream derived from the seed, so runs are reproducible.
class VecCartPole {
 public:
  static constexpr int kObsDim = CartPole::kObsDim;

  // What happened to each environment in one step of the vector.
  struct Step {
    std::vector<float> rewards;
    std::vector<uint8_t> terminated, truncated;
    // For truncated environments: the last observation before the automatic reset
    // (needed to bootstrap the value of the cut-off episode).
    std::vector<CartPole::Obs> final_obs;
    // Returns of the episodes that ended in this step.
    std::vector<double> finished_returns;
  };

  VecCartPole(int n, uint64_t seed) : envs_(n), returns_(n, 0.0), obs_(size_t(n) * kObsDim) {
    for (int i = 0; i < n; ++i) {
      rngs_.emplace_back(seed * 1000003u + static_cast<uint64_t>(i));
      set_obs(i, envs_[i].reset(rngs_[i]));
    }
  }

  int size() const { return static_cast<int>(envs_.size()); }
  // Current observations, row-major [size(), 4].
  const std::vector<float>& obs() const { return obs_; }

  // Steps every environment with its action; ended episodes restart at once (obs() then holds
  // the first observation of the new episode).
  Step step(const std::vector<int64_t>& actions) {
    const int n = size();
    Step out{
        std::vector<float>(n), std::vector<uint8_t>(n), std::vector<uint8_t>(n), std::vector<CartPole::Obs>(n), {}};
    for (int i = 0; i < n; ++i) {
      CartPole::StepResult r = envs_[i].step(static_cast<int>(actions[i]));
      out.rewards[i] = r.reward;
      out.terminated[i] = r.terminated;
      out.truncated[i] = r.truncated;
      returns_[i] += r.reward;
      if (r.terminated || r.truncated) {
        out.final_obs[i] = r.obs;
        out.finished_returns.push_back(returns_[i]);
        returns_[i] = 0;
        set_obs(i, envs_[i].reset(rngs_[i]));
      } else {
        set_obs(i, r.obs);
      }
    }
    return out;
  }

 private:
  void set_obs(int i, const CartPole::Obs& o) {
    for (int k = 0; k < kObsDim; ++k) obs_[size_t(i) * kObsDim + k] = o[k];
  }

  std::vector<CartPole> envs_;
  std::vector<std::mt19937_64> rngs_;
  std::vector<double> returns_;
  std::vector<float> obs_;
};

}  // namespace cartpole
